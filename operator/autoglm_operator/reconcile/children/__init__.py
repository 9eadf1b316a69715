"""Pure builders of an AutoGLMDeployment's children, as plain-dict manifests: the serving pods'
Deployment, Services, ConfigMap, Secret and PodDisruptionBudget (serving), and the router's
Deployment, PodDisruptionBudget and RBAC (router), and what spec.gateway publishes: the
InferencePool and its endpoint picker's Service (gateway)."""
