fn main() {
    eprintln!("toolrun-runner: not implemented yet");
    std::process::exit(2);
}
