{{/* Names and labels shared by every template. */}}

{{- define "autoglm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "autoglm.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "autoglm.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "autoglm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: autoglm
{{- end -}}

{{- define "autoglm.operatorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "autoglm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "autoglm.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "autoglm.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The image names hack/images.sh pushes (operator/autoglm_operator/resource/images.py). */}}
{{- define "autoglm.image" -}}
{{- $repository := .Values.image.repository | default (printf "%s/autoglm-operator" .Values.image.registry) -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "autoglm.runtimeImage" -}}
{{- printf "%s/autoglm-runtime:%s" .Values.image.registry .Chart.AppVersion -}}
{{- end -}}

{{- define "autoglm.routerImage" -}}
{{- printf "%s/autoglm-router:%s" .Values.image.registry .Chart.AppVersion -}}
{{- end -}}

{{/* The namespaces the operator watches in Namespace scope (the release namespace by default). */}}
{{- define "autoglm.watchNamespaces" -}}
{{- $namespaces := .Values.operator.watchNamespaces | default (list .Release.Namespace) -}}
{{- toJson (uniq $namespaces) -}}
{{- end -}}

{{/* The Lease the operator replicas elect a leader with; one per release. */}}
{{- define "autoglm.leaseName" -}}
{{- printf "%s-leader" (include "autoglm.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The RBAC rules, one list in files/operator-rules.yaml. */}}
{{- define "autoglm.rules" -}}
{{- .Files.Get "files/operator-rules.yaml" | fromYaml | toJson -}}
{{- end -}}

{{/* Prometheus relabelings that turn pod metadata into the labels every query groups by. */}}
{{- define "autoglm.deploymentLabelMeta" -}}
{{- printf "__meta_kubernetes_pod_label_%s" (regexReplaceAll "[^a-zA-Z0-9_]" .Values.monitoring.deploymentLabel "_") -}}
{{- end -}}

{{- define "autoglm.deploymentLabelPresent" -}}
{{- printf "__meta_kubernetes_pod_labelpresent_%s" (regexReplaceAll "[^a-zA-Z0-9_]" .Values.monitoring.deploymentLabel "_") -}}
{{- end -}}

{{/* Labels every serving pod carries (operator/autoglm_operator/reconcile/children/serving.py:
common_labels and the server component); the mode label is not among them, it changes on every flip. */}}
{{- define "autoglm.runtimePodLabels" -}}
app.kubernetes.io/name: autoglm
app.kubernetes.io/managed-by: autoglm-operator
app.kubernetes.io/component: server
{{- end -}}

{{/* The router pods the operator creates (operator/autoglm_operator/reconcile/children/router.py). */}}
{{- define "autoglm.routerPodLabels" -}}
app.kubernetes.io/name: autoglm-router
app.kubernetes.io/managed-by: autoglm-operator
app.kubernetes.io/component: router
{{- end -}}

{{- define "autoglm.routerPodSelectorString" -}}
{{- $labels := include "autoglm.routerPodLabels" . | fromYaml -}}
{{- $pairs := list -}}
{{- range $key := keys $labels | sortAlpha -}}
{{- $pairs = append $pairs (printf "%s=%s" $key (get $labels $key)) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{- define "autoglm.runtimePodSelectorString" -}}
{{- $labels := include "autoglm.runtimePodLabels" . | fromYaml -}}
{{- $pairs := list -}}
{{- range $key := keys $labels | sortAlpha -}}
{{- $pairs = append $pairs (printf "%s=%s" $key (get $labels $key)) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}
