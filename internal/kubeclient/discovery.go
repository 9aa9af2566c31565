package kubeclient

import (
	"context"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// discovery reads what client-go's discovery client reads, with a context.
type discovery struct{ rc *rest.RESTClient }

// ServerVersion GETs /version, which every authenticated client may read.
func (d discovery) ServerVersion(ctx context.Context) error {
	return d.rc.Get().AbsPath("/version").Do(ctx).Error()
}

// ServerResourcesForGroupVersion lists the resources the API server serves
// in groupVersion ("v1" for the core group, "networking.k8s.io/v1"); an API
// server that does not serve the group answers NotFound. The documents are
// asked for as JSON, as client-go's discovery client does: kp's client
// prefers protobuf, in which they are served too.
func (d discovery) ServerResourcesForGroupVersion(ctx context.Context, groupVersion string) (*metav1.APIResourceList, error) {
	path := "/apis/" + groupVersion
	if groupVersion == "v1" {
		path = "/api/v1"
	}
	raw, err := d.rc.Get().AbsPath(path).SetHeader("Accept", "application/json").Do(ctx).Raw()
	if err != nil {
		return nil, err
	}
	var list metav1.APIResourceList
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("discovery document %s: %w", path, err)
	}
	return &list, nil
}
