//! The file-access core of a session's workspace (placeholder; filled in by the workspace work).
