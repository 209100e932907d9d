//! flashpool NAND SSD simulator.
