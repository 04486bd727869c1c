"""Choosing speculation: acceptance vectors, the optimal tree, measured costs, per-domain
policies, the router that picks a domain, and the bench that times it all."""
