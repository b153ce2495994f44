fn main() {
    println!("toolrun");
}
