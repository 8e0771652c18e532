"""Test-only helpers for the `kind` tier: the probe that decides whether it can run,
the image and manifests it deploys, and the scenarios it runs against the deployment.

Nothing here is product code. The manifests are the smallest that run the operator and
the API in a cluster; the chart (issue 7) is the product's way to install them.
"""
