fn main() {
    std::process::exit(toolrun::cli::main());
}
