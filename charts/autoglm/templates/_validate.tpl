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
