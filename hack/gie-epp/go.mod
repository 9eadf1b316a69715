// Wrapper module: builds the Gateway API Inference Extension's endpoint picker (cmd/epp) from
// source through the Go module proxy, at the version of the InferencePool CRD hack/gie-crds.sh
// installs. `go install pkg@version` cannot be used: the proxy refuses the module's version list
// here (403 on @v/list). go.sum records the hashes every later build is verified against.
module autoglm.io/hack/gie-epp

go 1.25.0

require sigs.k8s.io/gateway-api-inference-extension v1.5.0 // indirect
