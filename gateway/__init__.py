"""`ratedeck gateway`: a local HTTP server that gives any program ratedeck's pacing.

A client points its base URL at the gateway and authenticates with the gateway's
token; each of its requests becomes one engine request (a `LiveSource`'s), sent
on a key the engine picks and answered when the upstream answers. Keys never
leave the gateway.
"""
