from modelyard.cli import main

main()
