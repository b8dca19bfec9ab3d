"""Many processes, one budget: a member's leases, shared gates and learned state through a store."""
