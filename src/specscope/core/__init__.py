"""The speculation core: one loop of named stages (prefill -> draft -> verify -> accept ->
commit) and the small shared pieces it is made of: the cached 4D-masked forward and cache surgery
(passes), distributions and draws (sampling), tree growth (draft), and the loop (loop).
Decoding (:mod:`specscope.decode`) and measurement (:mod:`specscope.measure`) differ only in the
accept stage they plug in."""
