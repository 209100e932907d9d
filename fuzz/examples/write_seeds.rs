//! Writes the valid on-disk structures of `flashpool_fuzz::decode_formats_seeds` into
//! corpus/decode_formats/, the seed corpus of the `decode_formats` target.

fn main() -> std::io::Result<()> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/decode_formats");
    std::fs::create_dir_all(&dir)?;
    for (name, bytes) in flashpool_fuzz::decode_formats_seeds() {
        std::fs::write(dir.join(name), bytes)?;
        println!("{}", dir.join(name).display());
    }
    Ok(())
}
