"""Kubernetes manifests for sandbox fleets (issue 22): `sandforge deploy render`, validated against the
Kubernetes client's models. Nothing here talks to a cluster."""
