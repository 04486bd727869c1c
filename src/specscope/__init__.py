"""specscope: acceptance dynamics of tree-based speculative decoding.

The library is organised one module per concern:

- ``models``    draft/target pairs: hub ids, local directories, GGUF files, the embedded demo pair
- ``trees``     draft trees as parents arrays, their derived buffers, and growth policies
- ``engine``    the measurement loop: grow a tree, score it in one target pass, record every node
- ``records``   run directories and their Parquet schemas
- ``domains``   prompt sources per domain (code, math, reasoning, chat, ...)
- ``analysis``  the paper's tables, corrected metrics, statistics, plots and reports
- ``theory``    acceptance criteria and their KL certificates
- ``decoding``  real speculative decoding and speculation policies
- ``cli``       the ``specscope`` command, a thin layer over the above
"""

__version__ = "0.1.0"
