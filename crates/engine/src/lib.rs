//! flashpool pool engine.
