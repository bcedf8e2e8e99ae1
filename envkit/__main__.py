from envkit.cli import main

main()
