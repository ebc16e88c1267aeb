"""Operating the native stack: provisioning, starting, supervising and stopping the servers and the
pipeline's processes (`python -m stack up|down|status|logs|clean`)."""
