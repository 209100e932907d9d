#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| flashpool_fuzz::open_corrupt_pool(data));
