{{/*
Names are fixed (the Services `toolrun-gateway` and `toolrun-operator-metrics` are part of the
contract with clients and dashboards), so one release per namespace; a second release goes in
another release namespace with another sandbox.namespace.
*/}}

{{/* Selector labels of one component: pass (dict "ctx" $ "component" "gateway"). */}}
{{- define "toolrun.selectorLabels" -}}
app.kubernetes.io/name: {{ .ctx.Chart.Name }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Standard labels of one component: pass (dict "ctx" $ "component" "gateway"). */}}
{{- define "toolrun.labels" -}}
{{ include "toolrun.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: toolrun
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
{{- end }}

{{/* An image reference: pass (dict "ctx" $ "image" .Values.images.gateway). */}}
{{- define "toolrun.image" -}}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) -}}
{{- end }}

{{/* The image of a language: its own, or images.sandbox. */}}
{{- define "toolrun.languageImage" -}}
{{- if .lang.image -}}
{{- .lang.image -}}
{{- else -}}
{{- include "toolrun.image" (dict "ctx" .ctx "image" .ctx.Values.images.sandbox) -}}
{{- end -}}
{{- end }}

{{/*
A language's entry in the operator's config, as JSON: image, interpreter and, when set,
runnerPath (where the image carries toolrun-runner; without it the operator copies the
runner in with an init container).
*/}}
{{- define "toolrun.languageConfig" -}}
{{- $c := dict "image" (include "toolrun.languageImage" .) -}}
{{- if .lang.interpreter -}}
{{- $_ := set $c "interpreter" .lang.interpreter -}}
{{- end -}}
{{- if .lang.runnerPath -}}
{{- $_ := set $c "runnerPath" .lang.runnerPath -}}
{{- else if and (not .lang.image) .ctx.Values.images.sandbox.runnerPath -}}
{{- $_ := set $c "runnerPath" .ctx.Values.images.sandbox.runnerPath -}}
{{- end -}}
{{- toJson $c -}}
{{- end }}

{{/*
The hardened pod securityContext of our own pods (gateway, operator): what the `restricted`
Pod Security Standard demands, and a fixed non-root uid/gid (65534, the images' user).
*/}}
{{- define "toolrun.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65534
runAsGroup: 65534
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* The hardened container securityContext of our own containers. */}}
{{- define "toolrun.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65534
runAsGroup: 65534
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
Egress to the API server (and nothing else) for the gateway and operator pods. Addresses:
networkPolicy.apiServer.cidrs, else the `kubernetes` Service's ClusterIP and the addresses of
its EndpointSlices (Helm's lookup: policies are evaluated after kube-proxy's DNAT by most
implementations, before it by some, so both are allowed), else (no cluster to look at:
helm template) any address on the API server's ports.
*/}}
{{- define "toolrun.apiServerEgress" -}}
{{- $cidrs := list -}}
{{- $ports := list -}}
{{- range .Values.networkPolicy.apiServer.ports -}}
{{- $ports = append $ports (int .) -}}
{{- end -}}
{{- if .Values.networkPolicy.apiServer.cidrs -}}
{{- $cidrs = .Values.networkPolicy.apiServer.cidrs -}}
{{- else -}}
{{- $svc := lookup "v1" "Service" "default" "kubernetes" -}}
{{- if and $svc $svc.spec $svc.spec.clusterIP -}}
{{- $cidrs = append $cidrs (printf "%s/32" $svc.spec.clusterIP) -}}
{{- end -}}
{{- $slices := lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "" -}}
{{- range (dig "items" list $slices) -}}
{{- if eq (dig "metadata" "labels" "kubernetes.io/service-name" "" .) "kubernetes" -}}
{{- $family := dig "addressType" "IPv4" . -}}
{{- range (dig "endpoints" list .) -}}
{{- range (dig "addresses" list .) -}}
{{- $cidrs = append $cidrs (printf "%s/%s" . (ternary "128" "32" (eq $family "IPv6"))) -}}
{{- end -}}
{{- end -}}
{{- range (dig "ports" list .) -}}
{{- $ports = append $ports (int (dig "port" 0 .)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
- ports:
{{- range ($ports | uniq) }}
{{- if gt . 0 }}
    - protocol: TCP
      port: {{ . }}
{{- end }}
{{- end }}
  to:
{{- if $cidrs }}
{{- range ($cidrs | uniq) }}
    - ipBlock:
        cidr: {{ . }}
{{- end }}
{{- else }}
    - ipBlock:
        cidr: 0.0.0.0/0
{{- end }}
{{- end }}

{{/* Fails on values the schema cannot express. */}}
{{- define "toolrun.validate" -}}
{{- if ne .Values.images.runner.pullPolicy .Values.images.sandbox.pullPolicy -}}
{{- fail "images.runner.pullPolicy and images.sandbox.pullPolicy must be equal: the operator sets one imagePullPolicy on both containers of a sandbox pod" -}}
{{- end -}}
{{- range $k, $d := .Values.sandbox.defaultLimits -}}
{{- $m := index $.Values.sandbox.maxLimits $k -}}
{{- if gt (int $d) (int $m) -}}
{{- fail (printf "sandbox.defaultLimits.%s (%d) is above sandbox.maxLimits.%s (%d)" $k (int $d) $k (int $m)) -}}
{{- end -}}
{{- end -}}
{{- if eq .Values.sandbox.namespace .Release.Namespace -}}
{{- fail (printf "sandbox.namespace (%s) must differ from the release namespace: the sandbox namespace holds only sandbox pods, under a deny-all NetworkPolicy and Pod Security restricted" .Release.Namespace) -}}
{{- end -}}
{{- if and (gt (int .Values.operator.replicas) 1) (not .Values.operator.controller.leaderElection.enabled) -}}
{{- fail "operator.replicas > 1 needs operator.controller.leaderElection.enabled: two operators without it would both reconcile every ToolRun" -}}
{{- end -}}
{{- $le := .Values.operator.controller.leaderElection -}}
{{- if ge (int $le.renewDeadlineSeconds) (int $le.leaseDurationSeconds) -}}
{{- fail (printf "operator.controller.leaderElection.renewDeadlineSeconds (%d) must be below leaseDurationSeconds (%d)" (int $le.renewDeadlineSeconds) (int $le.leaseDurationSeconds)) -}}
{{- end -}}
{{- if ge (int .Values.sandbox.tmpSizeMiB) (int .Values.sandbox.defaultLimits.memoryMiB) -}}
{{- fail (printf "sandbox.tmpSizeMiB (%d) must be below sandbox.defaultLimits.memoryMiB (%d): /tmp is in memory" (int .Values.sandbox.tmpSizeMiB) (int .Values.sandbox.defaultLimits.memoryMiB)) -}}
{{- end -}}
{{- end }}

{{/*
The configured languages (every `languages` entry but python, javascript and bash), as JSON:
`operator` for the operator's `languages` (image, runner, shell, extension, command, env) and
`gateway` for the gateway's `sandbox.languages` (extension, command, env): one list of
names, so run_code offers exactly what the pods run.
*/}}
{{- define "toolrun.configuredLanguages" -}}
{{- $operator := dict -}}
{{- $gateway := dict -}}
{{- range $name, $l := .Values.languages -}}
{{- if not (has $name (list "python" "javascript" "bash")) -}}
{{- $o := include "toolrun.languageConfig" (dict "ctx" $ "lang" $l) | fromJson -}}
{{- $g := dict "extension" $l.extension "command" $l.command -}}
{{- $_ := set $o "extension" $l.extension -}}
{{- $_ := set $o "command" $l.command -}}
{{- with $l.shell }}{{ $_ := set $o "shell" . }}{{ end -}}
{{- with $l.env }}{{ $_ := set $o "env" . }}{{ $_ := set $g "env" . }}{{ end -}}
{{- $_ := set $operator $name $o -}}
{{- $_ := set $gateway $name $g -}}
{{- end -}}
{{- end -}}
{{- toJson (dict "operator" $operator "gateway" $gateway) -}}
{{- end }}
