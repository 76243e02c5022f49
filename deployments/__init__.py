"""Ferry on Ray Serve: ingress, preprocessing, inference and postprocessing deployments."""
