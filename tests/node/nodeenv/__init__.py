"""Test-only helpers for the `node` tier: a real node — kube-scheduler, containerd + runc
and a kubelet — next to the cluster tier's control plane (tests/cluster/kubeenv), all
inside a private network, mount and PID namespace the test run makes for itself.

- ``netns``: running a pytest session (or any command) inside that namespace, and
  replaying its results in the calling session.
- ``network``: the namespace's addresses (node bridge, pod CIDR, the Service IP of the
  API server) and the private bind mounts of host paths the components write to.
- ``node``: the control plane adapted to a real node, and the node itself.
"""
