//! Harness for the real control-plane tests: starts etcd and kube-apiserver from KUBEBUILDER_ASSETS.
