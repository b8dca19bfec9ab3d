"""A request's walk once it leaves the queue: the key's sender loop, the send, the answer's facts, the decision, its end."""
