{{/* The alert rules, shared by the PrometheusRule and the plain-Prometheus rules file.
Runtime series carry namespace, pod and autoglm_deployment (see podmonitor.yaml and
prometheus-config.yaml); the operator's series carry the AutoGLMDeployment's namespace and name (scraped with
honor_labels, so its namespace is not replaced by the operator pod's). */}}
{{- define "autoglm.alertGroups" -}}
{{- $r := .Values.monitoring.prometheusRule -}}
- name: autoglm.alerts
  rules:
    - alert: AutoGLMReplicasNotReady
      expr: |
        max by (namespace, name) (autoglm_operator_replicas)
          - max by (namespace, name) (autoglm_operator_ready_replicas) > 0
      for: {{ $r.replicasNotReadyFor }}
      labels:
        severity: warning
      annotations:
        summary: AutoGLMDeployment {{ "{{ $labels.namespace }}/{{ $labels.name }}" }} has replicas that are not ready.
        description: >-
          {{ "{{ $value }}" }} replica(s) have not been ready for {{ $r.replicasNotReadyFor }}. `kubectl -n
          {{ "{{ $labels.namespace }}" }} describe agd {{ "{{ $labels.name }}" }}`: the Degraded condition names
          the cause (InsufficientGPU, image pull, crash loop).
    - alert: AutoGLMRuntimeMetricsDown
      expr: |
        max by (namespace, autoglm_deployment, pod) (up{autoglm_deployment!=""}) == 0
      for: {{ $r.metricsUnavailableFor }}
      labels:
        severity: warning
      annotations:
        summary: Prometheus cannot scrape serving pod {{ "{{ $labels.namespace }}/{{ $labels.pod }}" }}.
        description: >-
          The adaptive pass holds this replica's mode while its metrics are missing. Check that
          the pod is running and that /metrics on port 8000 answers.
    - alert: AutoGLMMetricsUnavailable
      expr: |
        max by (namespace, name) (autoglm_operator_metrics_available) == 0
      for: {{ $r.metricsUnavailableFor }}
      labels:
        severity: warning
      annotations:
        summary: The operator cannot read Prometheus for {{ "{{ $labels.namespace }}/{{ $labels.name }}" }}.
        description: >-
          Adaptive mode flips are on hold. The MetricsAvailable condition of the
          AutoGLMDeployment gives the reason (PrometheusUnreachable, QueryError, NoData).
    - alert: AutoGLMModeFlapping
      expr: |
        max by (namespace, autoglm_deployment, pod) (
          increase(autoglm_mode_switches_total[{{ $r.flappingWindow }}])
        ) > {{ $r.maxModeSwitches }}
      labels:
        severity: warning
      annotations:
        summary: Serving pod {{ "{{ $labels.namespace }}/{{ $labels.pod }}" }} switched mode {{ "{{ $value | humanize }}" }} times in {{ $r.flappingWindow }}.
        description: >-
          The adaptive thresholds are too close together for this traffic: widen the gap between
          the high and low thresholds, or lengthen the stabilization windows or the cooldown.
    - alert: AutoGLMRequestsRejected
      expr: |
        sum by (namespace, autoglm_deployment) (
          rate(autoglm_requests_rejected_total{reason=~"queue_full|queue_timeout"}[5m])
        ) > 0
      for: 10m
      labels:
        severity: info
      annotations:
        summary: AutoGLMDeployment {{ "{{ $labels.namespace }}/{{ $labels.autoglm_deployment }}" }} turns requests away ({{ "{{ $value | humanize }}" }}/s).
        description: >-
          The admission queues are full or time out: add replicas (kubectl scale agd) or raise the
          batching profile's maxConcurrency and maxQueue.
    - alert: AutoGLMRouterNoReplicas
      expr: |
        max by (namespace, autoglm_deployment) (
          sum by (namespace, autoglm_deployment, pod) (autoglm_router_replicas)
        ) == 0
        and on (namespace, autoglm_deployment)
        sum by (namespace, autoglm_deployment) (rate(autoglm_router_requests_total[5m])) > 0
      for: 2m
      labels:
        severity: critical
      annotations:
        summary: The router of {{ "{{ $labels.namespace }}/{{ $labels.autoglm_deployment }}" }} has no replica to send requests to, and requests arrive.
        description: >-
          Every request gets 503 from the router. The serving pods are all unready, draining or
          gone: `kubectl -n {{ "{{ $labels.namespace }}" }} get pods -l app.kubernetes.io/instance={{ "{{ $labels.autoglm_deployment }}" }}`
          and the AutoGLMDeployment's Degraded condition say why; the router's /health lists
          the replicas it takes.
    - alert: AutoGLMHoldQueueOverflow
      expr: |
        sum by (namespace, autoglm_deployment) (
          increase(autoglm_router_hold_overflows_total[5m])
        ) > 0
      labels:
        severity: warning
      annotations:
        summary: The routers of {{ "{{ $labels.namespace }}/{{ $labels.autoglm_deployment }}" }} answered {{ "{{ $value | humanize }}" }} request(s) 503 that they could not hold (5m).
        description: >-
          A request that finds no ready replica is held; past spec.router.hold (queueSize full,
          perClient full for its client, or waitSeconds waited) it gets 503 with Retry-After.
          reason="timeout": the replicas took longer than waitSeconds to start (the Waking state
          in status.standby and the Progressing condition say why: no GPU, image pull);
          reason="full": raise queueSize, or a floor of warm replicas (scaleToZero.floor) for this
          traffic; reason="client_full": one client (source address) sent more than perClient
          at once; behind a proxy that hides client addresses raise perClient to queueSize.
    # Held, and nothing starting: not Waking, and no replica the operator asks for is unready.
    # That leaves a deployment at zero nobody wakes (the operator down, or its reads of the
    # routers' ops port refused) and routers that hold although replicas are ready.
    - alert: AutoGLMHeldWithoutWake
      expr: |
        sum by (namespace, autoglm_deployment) (autoglm_router_held_requests) > 0
        unless on (namespace, autoglm_deployment)
        label_replace(
          max by (namespace, name) (autoglm_operator_standby_state{state="Waking"}) == 1
          or
          max by (namespace, name) (autoglm_operator_replicas)
            > max by (namespace, name) (autoglm_operator_ready_replicas),
          "autoglm_deployment", "$1", "name", "(.+)"
        )
      for: {{ $r.heldWithoutWakeFor }}
      labels:
        severity: critical
      annotations:
        summary: The routers of {{ "{{ $labels.namespace }}/{{ $labels.autoglm_deployment }}" }} hold {{ "{{ $value }}" }} request(s) and no replica is starting.
        description: >-
          Requests have been held for {{ $r.heldWithoutWakeFor }} while status.standby is not Waking and no
          replica the operator asks for is starting. With no replica running: the operator is
          not waking the deployment (is it running? does autoglm_operator_standby_held_requests
          see the requests? if not, it cannot read the routers' ops port, /autoglm/v1/demand:
          a NetworkPolicy, or scaleToZero is off and no KEDA ScaledObject activates on
          autoglm_router_held_requests). With replicas ready: the routers do not see them
          (their /health lists the replicas they take). Held requests get 503 after
          spec.router.hold.waitSeconds.
    # spec.autoscaling: the fleet runs maxReplicas and that is too few for the demand plus
    # headroom (status.autoscaling.reason AtMaxReplicas); the value is the replicas it runs.
    - alert: AutoGLMFleetAtMaxReplicas
      expr: |
        max by (namespace, name) (autoglm_operator_autoscaling_desired_replicas)
        and on (namespace, name)
        max by (namespace, name) (autoglm_operator_autoscaling_reason{reason="AtMaxReplicas"}) == 1
      for: {{ $r.fleetAtMaxReplicasFor }}
      labels:
        severity: warning
      annotations:
        summary: AutoGLMDeployment {{ "{{ $labels.namespace }}/{{ $labels.name }}" }} runs autoscaling.maxReplicas ({{ "{{ $value }}" }}) and the demand needs more.
        description: >-
          For {{ $r.fleetAtMaxReplicasFor }} the fleet has been at spec.autoscaling.maxReplicas while
          the demand plus headroomPercent is more than those replicas serve within the SLOs
          (status.autoscaling.reason AtMaxReplicas; its message gives the demand and what the
          fleet serves; the dashboard's "Demand and expected goodput" panel shows both). Below
          the demand itself the routers shed the excess with 429 (outcome refused). Raise
          maxReplicas where GPUs are free, or lower headroomPercent if the demand itself is served.
    - alert: AutoGLMRouterUpstreamErrors
      expr: |
        sum by (namespace, autoglm_deployment) (
          rate(autoglm_router_requests_total{outcome=~"upstream_error|unreachable|aborted"}[5m])
        )
        / sum by (namespace, autoglm_deployment) (rate(autoglm_router_requests_total[5m]))
        > 0.05
      for: 5m
      labels:
        severity: warning
      annotations:
        summary: More than 5% of the requests the router of {{ "{{ $labels.namespace }}/{{ $labels.autoglm_deployment }}" }} forwards fail at the replicas ({{ "{{ $value | humanizePercentage }}" }}).
        description: >-
          Outcomes upstream_error (a replica answered 5xx: a queue timeout, an engine error, a
          504 after --idle-timeout), unreachable (no replica could be reached, even after the
          one retry) and aborted (a stream cut after its first byte: a replica died mid-answer).
          The router's log names the replica of each; the serving pods' logs say why.
    - alert: AutoGLMRouterAddedLatencyHigh
      expr: |
        histogram_quantile(0.99, sum by (namespace, autoglm_deployment, le) (
          rate(autoglm_router_added_latency_seconds_bucket{phase="request"}[5m])
        )) > 0.025
      for: 10m
      labels:
        severity: warning
      annotations:
        summary: The router of {{ "{{ $labels.namespace }}/{{ $labels.autoglm_deployment }}" }} holds requests {{ "{{ $value | humanizeDuration }}" }} (p99) before they reach a replica.
        description: >-
          The routing decision itself takes well under a millisecond; a p99 above 25 ms means
          the router's event loop waits for CPU. Raise the router's CPU (spec.router.resources)
          or its replicas (spec.router.replicas).
{{- end -}}
