"""The demo API (`/generate` and its siblings) and the race page that shows static against
continuous batching."""
