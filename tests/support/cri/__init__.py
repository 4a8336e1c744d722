"""A kubelet stand-in of the project's own: a private containerd, local busybox images and pods made over CRI."""
