"""Models the project makes itself (for the real-engine tests and demo), never downloaded."""
