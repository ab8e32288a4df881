"""What ranks say to each other: model exchanges over a graph (``exchange``, the PushSum
and directed-exponential ``graphs``) and control messages as JSON in MPI byte buffers
(``control``: never pickles)."""
