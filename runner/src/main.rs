fn main() {
    std::process::exit(toolrun_runner::run::main_entry(std::env::args()));
}
