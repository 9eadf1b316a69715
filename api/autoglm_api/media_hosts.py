"""Which media hosts are never fetched: the runtime refuses their URLs, the CRD their domains."""

# Names that resolve inside the cluster or the node, never to a public media host.
INTERNAL_HOST_SUFFIXES = (".svc", ".local", ".internal", ".cluster", "localhost")
