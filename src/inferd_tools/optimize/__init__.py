"""`inferd optimize`: build lighter variants of an ONNX or PyTorch model (graph optimisation,
INT8 dynamic and static quantisation, FP16), measure speed and accuracy against the original
in process, and publish the winner as the model's next version, or refuse to.

The tool touches the server only through its public surface: the repository layout on disk,
`config.pbtxt` parsing (through `inferd.public`), and the HTTP API (to wait for the published
version and set canary weights). See docs/optimize.md.
"""
