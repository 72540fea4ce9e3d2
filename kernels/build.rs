//! Compiles kernels/csrc/*.cu with nvcc into a static library (sm_90a by default; CUDA_COMPUTE_CAP
//! overrides) and links it with the CUDA runtime.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let sources: Vec<PathBuf> = std::fs::read_dir("csrc")
        .expect("kernels/csrc")
        .map(|e| e.expect("dir entry").path())
        .collect();
    // The folder too, so an added or removed file rebuilds the library.
    println!("cargo:rerun-if-changed=csrc");
    for s in &sources {
        println!("cargo:rerun-if-changed={}", s.display());
    }
    for var in ["CUDA_COMPUTE_CAP", "CUDA_HOME", "NVCC"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let cuda_home = std::env::var("CUDA_HOME").unwrap_or_else(|_| "/usr/local/cuda".into());
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| {
        let p = Path::new(&cuda_home).join("bin/nvcc");
        if p.exists() {
            p.to_string_lossy().into_owned()
        } else {
            "nvcc".into()
        }
    });
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    // Hopper's wgmma and TMA need the architecture-specific sm_90a target.
    let gencode = if cap == "90" {
        "arch=compute_90a,code=sm_90a".to_string()
    } else {
        format!("arch=compute_{cap},code=sm_{cap}")
    };
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    // nvcc compiles one file on one core: as many at once as there are cores.
    let cu: Vec<&PathBuf> = sources
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    let at_once = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut objects = Vec::new();
    for batch in cu.chunks(at_once) {
        let running: Vec<(&PathBuf, PathBuf, std::process::Child)> = batch
            .iter()
            .map(|src| {
                let obj = out
                    .join(src.file_stem().expect("file name"))
                    .with_extension("o");
                let child = Command::new(&nvcc)
                    .args([
                        "-std=c++17",
                        "-O3",
                        "--use_fast_math",
                        "-gencode",
                        &gencode,
                        "-Xcompiler",
                        "-fPIC",
                        "-c",
                    ])
                    .arg(src)
                    .arg("-o")
                    .arg(&obj)
                    .spawn()
                    .unwrap_or_else(|e| panic!("running {nvcc}: {e} (set CUDA_HOME or NVCC)"));
                (*src, obj, child)
            })
            .collect();
        for (src, obj, mut child) in running {
            let status = child.wait().expect("waiting for nvcc");
            assert!(status.success(), "nvcc failed on {}", src.display());
            objects.push(obj);
        }
    }
    let lib = out.join("libpagewise_kernels.a");
    let _ = std::fs::remove_file(&lib);
    let status = Command::new("ar")
        .arg("crs")
        .arg(&lib)
        .args(&objects)
        .status()
        .expect("running ar");
    assert!(status.success(), "ar failed");
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static=pagewise_kernels");
    println!("cargo:rustc-link-search=native={cuda_home}/lib64");
    println!("cargo:rustc-link-lib=dylib=cudart");
    println!("cargo:rustc-link-lib=dylib=stdc++");
}
