"""The speculation core: each stage written once, for B rows (B = 1: one prompt), and the two
drivers that run them.

passes (the cached 4D-masked forward and cache surgery, the one place that runs a model over a
KV cache) -> sampling (distributions and draws) -> draft (which token each tree node takes) ->
stages (the draft, verify and commit passes of one step) -> loop (decoding: B = 1, commits the
accepted path) and batch (measurement: B rows, commits one token per row, the target's greedy
token, through :mod:`specscope.measure`)."""
