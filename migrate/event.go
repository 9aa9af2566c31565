package migrate

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpproxy/kp/internal/kubeclient"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// NodeEvents records each finished mode switch as an Event on kp's Node
// (kubectl describe node shows it), as kubelet records its own: in the
// default namespace, the Node's name as its UID.
func NodeEvents(client kubeclient.Interface, hostnameOverride string, log *slog.Logger) func(statusapi.Migration) {
	node, err := proxy.NodeName(hostnameOverride)
	if err != nil {
		return nil
	}
	return func(m statusapi.Migration) {
		ev := Event(node, m, time.Now())
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := client.CoreV1().Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
			log.Warn("could not record the mode switch as an Event on the Node", "node", node, "err", err)
		}
	}
}

// Event is the Event that records switch m on node.
func Event(node string, m statusapi.Migration, now time.Time) *v1.Event {
	reason, typ := "KPModeSwitched", v1.EventTypeNormal
	msg := fmt.Sprintf("kp switched from %s to %s (asked by %s)", m.From, m.To, m.RequestedBy)
	if m.Phase == statusapi.MigrationFailed {
		reason, typ = "KPModeSwitchFailed", v1.EventTypeWarning
		msg = fmt.Sprintf("kp did not switch from %s to %s (asked by %s): %s", m.From, m.To, m.RequestedBy, m.Error)
	}
	var steps []string
	for _, s := range m.Steps {
		d := s.Detail
		if s.Error != "" {
			d = "failed: " + s.Error
		}
		steps = append(steps, s.Name+": "+d)
	}
	if len(steps) > 0 {
		msg += "; " + strings.Join(steps, "; ")
	}
	t := metav1.NewTime(now)
	return &v1.Event{
		ObjectMeta:          metav1.ObjectMeta{GenerateName: node + ".kp-", Namespace: metav1.NamespaceDefault},
		InvolvedObject:      v1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: node, UID: types.UID(node)},
		Reason:              reason,
		Message:             msg,
		Type:                typ,
		Source:              v1.EventSource{Component: "kp", Host: node},
		FirstTimestamp:      t,
		LastTimestamp:       t,
		Count:               1,
		ReportingController: "kpproxy.io/kp",
		ReportingInstance:   node,
	}
}
