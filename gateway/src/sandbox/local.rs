//! The local Linux sandbox (not implemented yet).
