{{/* Rules across several values, checked before anything renders, each with what to change. */}}
{{- define "autoglm.validate" -}}
{{- $op := .Values.operator -}}
{{- if and (eq $op.scope "Cluster") $op.watchNamespaces -}}
{{- fail "operator.watchNamespaces only applies with operator.scope=Namespace: set operator.scope=Namespace, or remove watchNamespaces to watch every namespace" -}}
{{- end -}}
{{- if eq (int $op.healthPort) (int $op.metricsPort) -}}
{{- fail (printf "operator.healthPort and operator.metricsPort must differ (both are %v)" $op.healthPort) -}}
{{- end -}}
{{- if and (not .Values.serviceAccount.create) (not .Values.serviceAccount.name) -}}
{{- fail "serviceAccount.name is required when serviceAccount.create is false: name an existing ServiceAccount" -}}
{{- end -}}
{{- $mon := .Values.monitoring -}}
{{- range $kind := list "podMonitor" "serviceMonitor" -}}
{{- $m := get $mon $kind -}}
{{- if $m.enabled -}}
{{- if gt (include "autoglm.durationSeconds" $m.scrapeTimeout | int) (include "autoglm.durationSeconds" $m.interval | int) -}}
{{- fail (printf "monitoring.%s.scrapeTimeout (%s) must not exceed its interval (%s)" $kind $m.scrapeTimeout $m.interval) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if .Values.deployment.create -}}
{{- if not (kindIs "map" .Values.deployment.spec) -}}
{{- fail "deployment.spec must be an AutoGLMDeployment spec (a map); see kubectl explain agd.spec" -}}
{{- end -}}
{{- include "autoglm.validateAutoscaling" .Values.deployment.spec -}}
{{- if and (eq $op.scope "Namespace") (not (has .Release.Namespace (include "autoglm.watchNamespaces" . | fromJsonArray))) -}}
{{- fail (printf "deployment.create makes an AutoGLMDeployment in %s, which the operator does not watch: add it to operator.watchNamespaces" .Release.Namespace) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A Prometheus duration (one unit: 15s, 1m, 500ms) in whole seconds, for comparisons. */}}
{{- define "autoglm.durationSeconds" -}}
{{- $d := toString . -}}
{{- $n := regexFind "^[0-9]+" $d | int -}}
{{- $unit := regexReplaceAll "^[0-9]+" $d "" -}}
{{- $factor := dict "ms" 0 "s" 1 "m" 60 "h" 3600 "d" 86400 "w" 604800 "y" 31536000 -}}
{{- mul $n (get $factor $unit | default 1) -}}
{{- end -}}

{{/* deployment.spec.autoscaling: the CRD's rules across fields (its CEL messages), so `helm
template` and `helm lint` refuse what the apiserver would. Absent keys take the CRD's defaults;
hasKey, not default, since 0 is a value here. */}}
{{- define "autoglm.validateAutoscaling" -}}
{{- $auto := .autoscaling | default dict -}}
{{- if and (kindIs "map" $auto) $auto.enabled -}}
{{- $min := 1 -}}
{{- if hasKey $auto "minReplicas" -}}{{- $min = int $auto.minReplicas -}}{{- end -}}
{{- $max := 4 -}}
{{- if hasKey $auto "maxReplicas" -}}{{- $max = int $auto.maxReplicas -}}{{- end -}}
{{- $adaptive := .adaptive | default dict -}}
{{- $streaming := 1 -}}
{{- if hasKey $adaptive "minStreamingReplicas" -}}{{- $streaming = int $adaptive.minStreamingReplicas -}}{{- end -}}
{{- $router := .router | default dict -}}
{{- $routed := true -}}
{{- if hasKey $router "enabled" -}}{{- $routed = $router.enabled -}}{{- end -}}
{{- if gt $min $max -}}
{{- fail (printf "deployment.spec: autoscaling.minReplicas must not exceed autoscaling.maxReplicas (%d > %d)" $min $max) -}}
{{- end -}}
{{- if gt $streaming $max -}}
{{- fail (printf "deployment.spec: adaptive.minStreamingReplicas must not exceed autoscaling.maxReplicas (%d > %d)" $streaming $max) -}}
{{- end -}}
{{- if and (eq $min 0) (not $routed) -}}
{{- fail "deployment.spec: autoscaling.minReplicas 0 needs router.enabled: the router holds the requests that arrive while no replica runs" -}}
{{- end -}}
{{- if not (dig "prometheus" "url" "" $adaptive) -}}
{{- fail "deployment.spec: autoscaling.enabled needs adaptive.prometheus.url: the fleet is sized by the demand it measures" -}}
{{- end -}}
{{- end -}}
{{- end -}}
