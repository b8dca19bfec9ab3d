"""The wire: the transport protocol's HTTP implementation, the tuned client, signing, API rules, the probe."""
