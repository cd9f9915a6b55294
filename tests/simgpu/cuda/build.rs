fn main() {
    // The file is installed as libcuda.so.1; give it that soname like the real driver.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
