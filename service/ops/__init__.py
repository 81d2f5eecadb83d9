"""What operators and clients read about the service: /health, /load, /metrics, /livez, the
beacon that publishes them to the probe server, and /openapi.json."""
