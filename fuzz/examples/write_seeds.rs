//! Writes the seed corpora made by code: the valid on-disk structures of
//! `flashpool_fuzz::decode_formats_seeds` into corpus/decode_formats/ (the `decode_formats`
//! target), and the scripted NBD sessions of `flashpool_fuzz::nbd_session_seeds` into
//! corpus/nbd_session/, and the scripted NVMe/TCP queues of `flashpool_fuzz::nvme_session_seeds`
//! into corpus/nvme_session/. `write_seeds [TARGET...]` writes only the targets named.

type Seeds = fn() -> Vec<(&'static str, Vec<u8>)>;

fn main() -> std::io::Result<()> {
    let only: Vec<String> = std::env::args().skip(1).collect();
    let wanted = |t: &str| only.is_empty() || only.iter().any(|o| o == t);
    let sets: [(&str, Seeds); 3] = [
        ("decode_formats", flashpool_fuzz::decode_formats_seeds),
        ("nbd_session", flashpool_fuzz::nbd_session_seeds),
        ("nvme_session", flashpool_fuzz::nvme_session_seeds),
    ];
    for (target, seeds) in sets {
        if !wanted(target) {
            continue;
        }
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("corpus")
            .join(target);
        std::fs::create_dir_all(&dir)?;
        for (name, bytes) in seeds() {
            std::fs::write(dir.join(name), bytes)?;
            println!("{}", dir.join(name).display());
        }
    }
    Ok(())
}
