"""toolrun.v1: the gRPC stubs generated at build time from proto/toolrun/v1/toolrun.proto.

``toolrun_pb2`` (messages) and ``toolrun_pb2_grpc`` (``ToolServiceStub``) are written here by
the build (setup.py); they are not in the source tree.
"""
