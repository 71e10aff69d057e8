"""What travels between the worker, the gateway and the web: one set of typed models, imported by both services.

Pure pydantic, no service imports: the gateway's image (no torch) and the worker's both carry this package.
"""
