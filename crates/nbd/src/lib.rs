//! flashpool NBD front-end.
