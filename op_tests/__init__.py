"""op_tests"""
