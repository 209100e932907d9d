#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| flashpool_fuzz::nvme_session(data));
