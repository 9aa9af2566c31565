package main

import "strings"

// edgeManifests are manifests at the edges of what kp reads; the tracker's
// node is "node" (fuzzsync.NodeName). Most decode; the last few are
// rejected, so the decoder's errors are fuzzed from them.
var edgeManifests = map[string]string{
	"demo-on-this-node": `apiVersion: v1
kind: Node
metadata: {name: node}
status: {addresses: [{type: InternalIP, address: 10.244.2.1}, {type: InternalIP, address: fd00:2::1}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  type: NodePort
  clusterIPs: [10.96.0.80]
  ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: demo, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints:
- {addresses: [10.244.1.10], nodeName: node}
- {addresses: [10.244.1.11], nodeName: other}
- {addresses: [10.244.1.12], conditions: {ready: false, serving: true, terminating: true}, nodeName: node}
`,
	"dual-stack-every-kind": `apiVersion: v1
kind: Service
metadata: {name: lb, namespace: shop}
spec:
  type: LoadBalancer
  ipFamilyPolicy: RequireDualStack
  clusterIPs: [10.96.0.20, fd00:96::20]
  externalIPs: [192.0.2.7, 2001:db8::7]
  loadBalancerSourceRanges: [198.51.100.0/24, 2001:db8:1::/48]
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}
  ports:
  - {name: https, protocol: TCP, port: 443, targetPort: 8443, nodePort: 30443}
  - {name: dns, protocol: UDP, port: 53, targetPort: 5353, nodePort: 30053}
  - {name: sctp, protocol: SCTP, port: 9000, targetPort: 9000, nodePort: 30900}
status: {loadBalancer: {ingress: [{ip: 203.0.113.7}, {ip: "2001:db8::99"}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-v4, namespace: shop, labels: {kubernetes.io/service-name: lb}}
addressType: IPv4
ports: [{name: https, protocol: TCP, port: 8443}, {name: dns, protocol: UDP, port: 5353}, {name: sctp, protocol: SCTP, port: 9000}]
endpoints:
- {addresses: [10.244.1.2], nodeName: node, zone: z1}
- {addresses: [10.244.2.3], nodeName: other, zone: z2}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-v6, namespace: shop, labels: {kubernetes.io/service-name: lb}}
addressType: IPv6
ports: [{name: https, protocol: TCP, port: 8443}, {name: dns, protocol: UDP, port: 5353}]
endpoints:
- {addresses: ["fd00:244::2"], nodeName: node}
---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: kubernetes}
spec: {cidrs: [10.96.0.0/16, fd00:96::/108]}
`,
	"two-services-one-clusterip-and-shared-endpoints": `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: a, namespace: n}
  spec: {clusterIPs: [10.96.0.30], ports: [{name: p, port: 80}]}
- apiVersion: v1
  kind: Service
  metadata: {name: b, namespace: n}
  spec: {clusterIPs: [10.96.0.30], internalTrafficPolicy: Local, ports: [{name: p, port: 81}]}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: a-1, namespace: n, labels: {kubernetes.io/service-name: a}}
  addressType: IPv4
  ports: [{name: p, port: 8080}]
  endpoints: [{addresses: [10.244.1.5]}, {addresses: [10.244.1.5]}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: a-2, namespace: n, labels: {kubernetes.io/service-name: a}}
  addressType: IPv4
  ports: [{name: p, port: 8080}]
  endpoints: [{addresses: [10.244.1.5]}, {addresses: [10.244.1.6], conditions: {ready: false}}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: b-1, namespace: n, labels: {kubernetes.io/service-name: b}}
  addressType: IPv4
  ports: [{name: p, port: 8081}]
  endpoints: [{addresses: [10.244.2.7], nodeName: other}]
`,
	"headless-externalname-and-no-ports": `{"apiVersion":"v1","kind":"Service","metadata":{"name":"h","namespace":"n"},"spec":{"clusterIP":"None","ports":[{"port":80}]}}
---
{"apiVersion":"v1","kind":"Service","metadata":{"name":"x","namespace":"n"},"spec":{"type":"ExternalName","externalName":"example.com"}}
---
{"apiVersion":"v1","kind":"Service","metadata":{"name":"e","namespace":"n"},"spec":{"clusterIPs":["10.96.0.40"]}}
`,
	"empty-file":    "",
	"comments-only": "# nothing here\n---\n# nor here\n",
	"rejected-unknown-field": `apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec: {clusterIPs: [10.96.0.80], ports: [{port: 80}], colour: blue}
`,
	"rejected-duplicate-object": `apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec: {clusterIPs: [10.96.0.80], ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec: {clusterIPs: [10.96.0.81], ports: [{port: 81}]}
`,
	"rejected-bad-separator": "apiVersion: v1\nkind: Node\nmetadata: {name: node}\n--- oops\n",
}

const configHeader = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"

// configFiles are KubeProxyConfiguration files: valid ones per mode, and
// the errors TestConfigFileErrors names.
var configFiles = map[string]string{
	"header-only": configHeader,
	"nftables": configHeader + "mode: nftables\nclusterCIDR: 10.244.0.0/16,fd00:10:244::/56\nnodePortAddresses: [primary]\n" +
		"nftables: {masqueradeBit: 15, syncPeriod: 20s, minSyncPeriod: 2s}\n",
	"iptables": configHeader + "mode: iptables\niptables: {masqueradeAll: true, localhostNodePorts: false}\n" +
		"conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 1h, tcpCloseWaitTimeout: 30m}\n",
	"ipvs": configHeader + "mode: ipvs\nipvs: {scheduler: mh, strictARP: true, excludeCIDRs: [10.1.0.0/16], tcpTimeout: 1m, udpTimeout: 5s}\n",
	"logging": configHeader + "logging: {format: json, flushFrequency: 5000000000, verbosity: 4, " +
		"vmodule: [{filePattern: 'proxy*', verbosity: 6}]}\nfeatureGates: {NFTablesProxyMode: true}\n",
	"min-sync-longer-than-sync": configHeader + "nftables: {syncPeriod: 1s, minSyncPeriod: 1m}\n",
	"unknown-field":             configHeader + "ipvs: {schedular: rr}\n",
	"duplicated-field":          configHeader + "mode: nftables\nmode: iptables\n",
	"wrong-kind":                "apiVersion: v1\nkind: ConfigMap\n",
	"empty":                     "",
	"wrong-type":                configHeader + "nftables: {masqueradeBit: high}\n",
	"mark-bit-out-of-range":     configHeader + "iptables: {masqueradeBit: 40}\nmode: iptables\n",
	"unsupported":               configHeader + "portRange: 30000-32767\nwinkernel: {networkName: l2bridge}\n",
	"json":                      `{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration","mode":"userspace","hostnameOverride":" Node-B "}`,
}

// migrationRequests are a body and a client address each.
var migrationRequests = map[string][2]string{
	"to-iptables-legacy":   {`{"to":"iptables-legacy","requestedBy":"kp migrate node"}`, "127.0.0.1:40000"},
	"to-ipvs-over-ipv6":    {`{"to":" ipvs "}`, "[::1]:40000"},
	"to-none":              {`{"to":"none"}`, "127.0.0.1:40000"},
	"from-another-host":    {`{"to":"nftables"}`, "192.0.2.1:40000"},
	"unknown-mode":         {`{"to":"kernelspace"}`, "127.0.0.1:40000"},
	"not-json":             {`to=nftables`, "127.0.0.1:40000"},
	"trailing-data":        {`{"to":"userspace"} {"to":"none"}`, "127.0.0.1:40000"},
	"no-port-in-address":   {`{"to":"nftables"}`, "127.0.0.1"},
	"ipv4-mapped-loopback": {`{"to":"iptables"}`, "[::ffff:127.0.0.1]:1"},
}

var servicesQueries = map[string]string{
	"all":             "",
	"namespace":       "namespace=ns",
	"service":         "namespace=other&service=api",
	"repeated":        "namespace=ns&namespace=other",
	"malformed":       "namespace=%zz&service=web;x",
	"service-only":    "service=web",
	"unknown-and-odd": "limit=-1&&=&namespace=",
}

// nodeAnnotation is one input of FuzzNodeAnnotations: a value of
// kpproxy.io/proxy-mode, whether kp runs with --allow-mode-none, whether
// the value is there at start, and a value of kpproxy.io/migration.
type nodeAnnotation struct {
	mode               string
	allowNone, atStart bool
	record             string
}

const recordTime = `,"time":"2026-11-27T08:00:00Z"}`

var nodeAnnotations = map[string]nodeAnnotation{
	"none-at-all":                 {},
	"nftables-while-running":      {mode: "nftables", record: `{"kind":"to","to":"nftables","phase":"done"` + recordTime},
	"iptables-legacy-at-start":    {mode: "iptables-legacy", atStart: true, record: `{"kind":"from-kube-proxy","phase":"running"` + recordTime},
	"iptables-nft-spaced":         {mode: " iptables-nft\n", record: `{"kind":"to","to":"iptables","phase":"failed","step":"verify","error":"no counters moved"` + recordTime},
	"ipvs":                        {mode: "ipvs", record: `{"kind":"from-kube-proxy","to":"ipvs","phase":"rolling-back","previous":"nftables","previousAnnotation":"ipvs"` + recordTime},
	"userspace-at-start":          {mode: "userspace", atStart: true, record: "null"},
	"none-refused":                {mode: "none", record: `{"kind":"to","phase":"paused"` + recordTime},
	"none-allowed":                {mode: "none", allowNone: true, record: `{"kind":"sideways","phase":"done"` + recordTime},
	"none-refused-at-start":       {mode: "none", atStart: true, record: "{}"},
	"upper-case":                  {mode: "IPTABLES", record: "not json"},
	"unknown-mode":                {mode: "kernelspace", record: `[{"kind":"to"}]`},
	"only-spaces":                 {mode: "   ", record: `{"kind":"to","phase":"done","time":"yesterday"}`},
	"control-characters":          {mode: "nft\x00ables\r\n\x1b[31m", record: "{\"kind\":\"to\",\"phase\":\"done\",\"error\":\"\\u0000\\n\"" + recordTime},
	"invalid-utf8":                {mode: "ipvs\xff\xfe", record: "{\"kind\":\"to\xff\",\"phase\":\"done\"" + recordTime},
	"long-value-cut-inside-rune":  {mode: strings.Repeat("x", 63) + "é" + strings.Repeat("y", 300), record: `{"kind":"to","phase":"` + strings.Repeat("z", 300) + `"` + recordTime},
	"long-value-of-continuations": {mode: strings.Repeat("\x80", 4096), atStart: true, record: strings.Repeat("{", 4096)},
}
