//! Assembles each asm/*.S into a flat binary with the system toolchain (gcc + ld), linked at the
//! address named in its first line (`// load: 0x...`), and writes `guests.rs` listing them.
//! A first line `// load: 0x... elf32` makes a 32-bit ELF executable instead (a Multiboot
//! kernel, booted with `--kernel` like kvm-unit-tests' x86/*.flat).

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
        let first = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("// load: 0x"))
            .unwrap_or_else(|| panic!("{}: first line must be `// load: 0x...`", src.display()));
        let (hex, elf32) = match first.trim().strip_suffix(" elf32") {
            Some(h) => (h, true),
            None => (first.trim(), false),
        };
        let load = u64::from_str_radix(hex, 16).unwrap();
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
        let (cc_arch, ld_format): (&[&str], &[&str]) = match elf32 {
            true => (&["-m32"], &["-m", "elf_i386", "-z", "max-page-size=0x1000"]),
            false => (&[], &["--oformat", "binary"]),
        };
        run(Command::new("gcc")
            .args(cc_arch)
            .args(["-c", "-nostdlib", "-o"])
            .arg(&obj)
            .arg(&src));
        run(Command::new("ld")
            .arg("-nostdlib")
            .args(ld_format)
            .args([&format!("-Ttext=0x{load:x}"), "-e", "start", "-o"])
            .arg(&bin)
            .arg(&obj));
        entries.push_str(&format!(
            "pub const {}: TinyGuest = TinyGuest {{ name: \"{name}\", image: include_bytes!(\"{}\"), load_addr: {load:#x}, long_mode: {long_mode}, multiboot: {elf32} }};\n",
            name.to_uppercase(),
            bin.display()
        ));
    }
    std::fs::write(out.join("guests.rs"), entries).unwrap();
}
