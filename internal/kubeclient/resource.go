package kubeclient

import (
	"context"
	"reflect"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// object is a typed API object or list, as a pointer (*v1.Service).
type object interface {
	runtime.Object
	comparable
}

// resource is the typed client of one resource: T its object type, L its
// list type. The requests are those of client-go's generated clients
// (gentype.Client), which kp cannot link without the whole clientset's
// apply configurations.
type resource[T, L object] struct {
	rc        rest.Interface
	name      string // the resource's plural, "services"
	namespace string // "" for every namespace, or a cluster-scoped kind
}

// newOf allocates what a pointer type points at: *v1.Service gives
// &v1.Service{}.
func newOf[P object]() P {
	var p P
	return reflect.New(reflect.TypeOf(p).Elem()).Interface().(P)
}

func (r resource[T, L]) request(req *rest.Request) *rest.Request {
	return req.NamespaceIfScoped(r.namespace, r.namespace != "").Resource(r.name)
}

func timeout(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}

func (r resource[T, L]) List(ctx context.Context, opts metav1.ListOptions) (L, error) {
	list := newOf[L]()
	err := r.request(r.rc.Get()).VersionedParams(&opts, parameterCodec).Timeout(timeout(opts)).Do(ctx).Into(list)
	return list, err
}

func (r resource[T, L]) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return r.request(r.rc.Get()).VersionedParams(&opts, parameterCodec).Timeout(timeout(opts)).Watch(ctx)
}

func (r resource[T, L]) Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error) {
	obj := newOf[T]()
	err := r.request(r.rc.Get()).Name(name).VersionedParams(&opts, parameterCodec).Do(ctx).Into(obj)
	return obj, err
}

func (r resource[T, L]) Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error) {
	out := newOf[T]()
	err := r.request(r.rc.Post()).VersionedParams(&opts, parameterCodec).Body(obj).Do(ctx).Into(out)
	return out, err
}

func (r resource[T, L]) Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error) {
	out := newOf[T]()
	meta, ok := any(obj).(metav1.Object)
	if !ok {
		panic("kubeclient: Update of an object without metadata") // every kind here has it
	}
	err := r.request(r.rc.Put()).Name(meta.GetName()).VersionedParams(&opts, parameterCodec).Body(obj).Do(ctx).Into(out)
	return out, err
}

func (r resource[T, L]) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error) {
	out := newOf[T]()
	err := r.request(r.rc.Patch(pt)).Name(name).SubResource(subresources...).VersionedParams(&opts, parameterCodec).Body(data).Do(ctx).Into(out)
	return out, err
}

func (r resource[T, L]) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return r.request(r.rc.Delete()).Name(name).Body(&opts).Do(ctx).Error()
}
