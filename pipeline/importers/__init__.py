"""Model importers: files of other frameworks into Ferry's native graph of two-phase ops.

``onnx_graph.load_onnx`` reads an ONNX file (the ``onnx`` package, an optional extra, is
imported when a file is read).
"""
