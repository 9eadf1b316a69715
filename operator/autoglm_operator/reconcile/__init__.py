"""The reconcile pass's planning, pure: the children an AutoGLMDeployment should have
(children.serving, children.router, children.gateway), what the kopf indexes hold (observe),
the plan of one iteration with the adaptive pass's mode entries in it (plan), and the status
(status).

May import `autoglm_operator.adaptive` and `autoglm_operator.resource`: no kopf, no Kubernetes
or HTTP client. io.executor carries the plan out.
"""
