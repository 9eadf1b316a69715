"""The AutoGLMDeployment resource, pure: the spec model the CRD is generated from (spec, crd),
the default images (images), the labels and names every child carries (names), and the one view
of a pod every pass asks (pods).

Imports nothing of the operator's other packages: every other package reads the resource.
"""
