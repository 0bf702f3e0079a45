"""The default pool of user queries: questions a user of a small (coding) assistant asks, short enough that
a reply of a few dozen tokens already shows a system prompt's effect. The last `heldout=` are held out."""

from __future__ import annotations

QUERIES = (
    "How do I reverse a list in Python?",
    "What is a closure?",
    "Why is the sky blue?",
    "Write a function that adds two numbers.",
    "What does HTTP stand for?",
    "How do I read a file line by line in Python?",
    "What is the difference between a list and a tuple?",
    "Explain recursion in simple terms.",
    "How can I sort a dictionary by its values?",
    "What is a good name for a pet cat?",
    "How do I check if a string is a palindrome?",
    "What is Git used for?",
    "Give me a tip for writing clean code.",
    "How do I remove duplicates from a list?",
    "What is the capital of Australia?",
    "How do I merge two dictionaries?",
    "What is a hash table?",
    "How do I count the words in a sentence?",
    "Why do programmers use version control?",
    "What is the difference between a process and a thread?",
    "How do I convert a string to an integer?",
    "What is an API?",
    "How do I find the largest number in a list?",
    "Suggest a simple project to learn programming.",
)
