//! `calculator` (being written).
