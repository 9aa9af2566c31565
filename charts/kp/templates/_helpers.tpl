{{/*
kp.namespace: kube-system, or the install fails saying why. kp replaces
kube-proxy, which runs there; its DaemonSet's priority class,
system-node-critical, is admitted only there by default; kp migrate cluster
and kp's docs look for kp there.
*/}}
{{- define "kp.namespace" -}}
{{- if ne .Release.Namespace "kube-system" -}}
{{- fail (printf "kp installs into kube-system (where kube-proxy runs, system-node-critical pods are admitted and kp migrate cluster looks for it), not %q: helm install kp ./charts/kp --namespace kube-system" .Release.Namespace) -}}
{{- end -}}
kube-system
{{- end -}}

{{/*
kp.labels: what manifests/kustomization.yaml adds to every object's labels,
and no more, so that the chart's objects are manifests/' own.
*/}}
{{- define "kp.labels" -}}
app.kubernetes.io/name: kp
{{- end -}}

{{/*
kp.image: repository@digest when the digest is set, else repository:tag
(the tag defaults to the chart's appVersion).
*/}}
{{- define "kp.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/*
kp.scalar: a string as a YAML scalar, plain when it reads back as the same
string (addresses, CIDRs, durations, mode names), quoted otherwise.
*/}}
{{- define "kp.scalar" -}}
{{- $s := toString . -}}
{{- if and (regexMatch "^[A-Za-z0-9][A-Za-z0-9./,:_-]*$" $s) (not (regexMatch "^([0-9.eE+-]+|true|false|yes|no|on|off|null|~)$" (lower $s))) -}}
{{ $s }}
{{- else -}}
{{ quote $s }}
{{- end -}}
{{- end -}}

{{/*
kp.affinity: .Values.affinity with, when migrationLabel is set, the term of
kp migrate cluster's node label (kpproxy.io/proxy NotIn [kube-proxy]) added
to each required node selector term (terms are ORed: each needs it), or as
the one term.
*/}}
{{- define "kp.affinity" -}}
{{- $affinity := deepCopy (.Values.affinity | default dict) -}}
{{- if .Values.migrationLabel -}}
{{- $notKubeProxy := dict "key" "kpproxy.io/proxy" "operator" "NotIn" "values" (list "kube-proxy") -}}
{{- $node := get $affinity "nodeAffinity" | default dict -}}
{{- $required := get $node "requiredDuringSchedulingIgnoredDuringExecution" | default dict -}}
{{- $terms := get $required "nodeSelectorTerms" | default (list dict) -}}
{{- $withLabel := list -}}
{{- range $terms -}}
{{- $term := deepCopy . -}}
{{- $_ := set $term "matchExpressions" (append (get $term "matchExpressions" | default list) $notKubeProxy) -}}
{{- $withLabel = append $withLabel $term -}}
{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" $withLabel -}}
{{- $_ := set $node "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- $_ := set $affinity "nodeAffinity" $node -}}
{{- end -}}
{{- if $affinity -}}
{{ toYaml $affinity }}
{{- end -}}
{{- end -}}

{{/*
kp.files: config.conf and kubeconfig.conf, as a dict: from fromKubeProxy
(the ConfigMap kp migrate cluster --from-kube-proxy --print-config
prints), from config and kubeconfig, or from the values; an empty entry
means "write it from the values".
*/}}
{{- define "kp.files" -}}
{{- $files := dict "config" .Values.config "kubeconfig" .Values.kubeconfig -}}
{{- if .Values.fromKubeProxy -}}
{{- if or .Values.config .Values.kubeconfig -}}
{{- fail "fromKubeProxy holds config.conf and kubeconfig.conf: leave config and kubeconfig empty" -}}
{{- end -}}
{{- $printed := fromYaml .Values.fromKubeProxy -}}
{{- if hasKey $printed "Error" -}}
{{- fail (printf "fromKubeProxy: not the YAML of a ConfigMap (kp migrate cluster --from-kube-proxy --print-config's output): %s" (get $printed "Error")) -}}
{{- end -}}
{{- $data := get $printed "data" | default dict -}}
{{- if or (ne (get $printed "kind") "ConfigMap") (not (get $data "config.conf")) (not (get $data "kubeconfig.conf")) -}}
{{- fail "fromKubeProxy: want the ConfigMap kp migrate cluster --from-kube-proxy --print-config prints, with data config.conf and kubeconfig.conf" -}}
{{- end -}}
{{- $files = dict "config" (get $data "config.conf") "kubeconfig" (get $data "kubeconfig.conf") -}}
{{- end -}}
{{- toYaml $files -}}
{{- end -}}
