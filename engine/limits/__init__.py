"""What a send may spend: window limiters and their policies, estimates, headroom, budgets, leases, costs, in-flight sizes, the waker."""
