//! Assembles each asm/*.S into a flat binary with the system toolchain (gcc + ld), linked at the
//! address named in its first line (`// load: 0x...`), and writes `guests.rs` listing them.

use std::path::PathBuf;
use std::process::Command;

fn run(cmd: &mut Command) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} (install gcc and binutils)"));
    assert!(status.success(), "{cmd:?} failed");
}

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let mut entries = String::new();
    let mut files: Vec<_> = std::fs::read_dir("asm")
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    println!("cargo:rerun-if-changed=asm");
    for src in files
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "S"))
    {
        println!("cargo:rerun-if-changed={}", src.display());
        let text = std::fs::read_to_string(&src).unwrap();
        let load = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("// load: 0x"))
            .map(|h| u64::from_str_radix(h.trim(), 16).unwrap())
            .unwrap_or_else(|| panic!("{}: first line must be `// load: 0x...`", src.display()));
        // Long mode if the source, or a file it #includes, switches to .code64.
        let included: String = text
            .lines()
            .filter_map(|l| {
                l.strip_prefix("#include \"")
                    .and_then(|r| r.strip_suffix('"'))
            })
            .map(|inc| std::fs::read_to_string(src.parent().unwrap().join(inc)).unwrap())
            .collect();
        let long_mode = text.contains(".code64") || included.contains(".code64");
        let name = src.file_stem().unwrap().to_str().unwrap().to_string();
        let obj = out.join(format!("{name}.o"));
        let bin = out.join(format!("{name}.bin"));
        run(Command::new("gcc")
            .args(["-c", "-nostdlib", "-o"])
            .arg(&obj)
            .arg(&src));
        run(Command::new("ld")
            .args([
                "-nostdlib",
                "--oformat",
                "binary",
                &format!("-Ttext=0x{load:x}"),
                "-e",
                "start",
                "-o",
            ])
            .arg(&bin)
            .arg(&obj));
        entries.push_str(&format!(
            "pub const {}: TinyGuest = TinyGuest {{ name: \"{name}\", image: include_bytes!(\"{}\"), load_addr: {load:#x}, long_mode: {long_mode} }};\n",
            name.to_uppercase(),
            bin.display()
        ));
    }
    std::fs::write(out.join("guests.rs"), entries).unwrap();
}
